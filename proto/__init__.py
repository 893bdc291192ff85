"""Generated gRPC stubs of external APIs (see proto/generate.py)."""
