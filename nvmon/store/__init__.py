"""Local history: raw ticks for a bounded window, 1-minute rollups for longer, in one SQLite file.

`Store` is the daemon's writer; `nvmon.store.query` reads (read-only) for `nvmon history`.
The schema is described in docs/store.md.
"""

from nvmon.store.errors import StoreError
from nvmon.store.schema import SCHEMA_VERSION
from nvmon.store.store import Store

__all__ = ["SCHEMA_VERSION", "Store", "StoreError"]
