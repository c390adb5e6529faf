"""Compiled code kept between runs: cache files, their keys, the builders' lock, ahead-of-time calls.

Imports none of its modules, so a mode can import a key without the ahead-of-time cache,
which imports the modes.
"""
