"""The build-it exercises' checks (a package, so that its conftest does not shadow tests/conftest.py)."""
