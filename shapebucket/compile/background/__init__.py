"""Compile while training: train eagerly while a spawned process compiles each shape of the
plan (:func:`~shapebucket.compile.compile_in_background`)."""
