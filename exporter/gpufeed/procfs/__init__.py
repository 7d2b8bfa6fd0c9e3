"""Pure parsers for files under /proc: text in, typed values out, no I/O."""
