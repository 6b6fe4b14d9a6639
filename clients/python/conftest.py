# Makes `event_store_client` importable from this directory's tests (pytest puts this directory on sys.path).
