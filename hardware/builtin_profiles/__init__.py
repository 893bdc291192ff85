"""Built-in node profiles of real machines (YAML files, loaded by ``hardware.profiles``)."""
