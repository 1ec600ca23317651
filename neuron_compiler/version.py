"""The package's version, in a module of its own: ``neuron_compiler.__version__`` re-exports it,
and the modules that record it (the compile cache's key, ``neuron-eval``'s report) import it from
here, never from the package (whose ``__init__`` imports them in turn).

Invariant: equal to ``version`` in pyproject.toml.
"""
__version__ = "0.1.0"
