"""Building a release without a container daemon: the OCI image archive (``release.image``) and its
base layer (``release/image-base.sh``). Used by scripts/build-image, .github/workflows/release.yml
and the realnode e2e tier."""
