//! Integration tests for liveness live in `tests/`; shared helpers live here.
