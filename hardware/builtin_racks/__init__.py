"""Built-in rack profiles (multi-node NVLink domains; YAML files, loaded by ``hardware.profiles``)."""
