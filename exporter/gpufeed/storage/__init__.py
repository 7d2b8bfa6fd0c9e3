"""Storage-tier helpers for the storage collector: mount selection, tier mapping, bounded stats."""
