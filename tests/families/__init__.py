"""Kernel families that exist only for the tests, registered by tests/conftest.py through
``evotuner.family.register`` (the same registry the packaged FlashCore family is in)."""
