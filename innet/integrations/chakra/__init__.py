"""MLCommons Chakra execution traces replayed on the fabric: ``trace`` (the .et format, read and written),
``replay`` (a trace's nodes in virtual time, its communication through the emulated network), ``record`` (what a
replay reports)."""
