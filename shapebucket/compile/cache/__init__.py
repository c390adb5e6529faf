"""Compiled code kept between runs: cache files, their keys, the builders' lock, ahead-of-time calls.

Import the modules themselves (:mod:`.save`, :mod:`.load`, :mod:`.key`, :mod:`.lock`,
:mod:`.aot`); this package imports none of them, so a mode can import a key without the
ahead-of-time cache, which imports the modes.
"""
