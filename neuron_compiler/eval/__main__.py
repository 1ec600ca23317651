"""``python -m neuron_compiler.eval MODEL ...`` is ``neuron-eval MODEL ...``."""
import sys

from neuron_compiler.eval.cli import main

sys.exit(main())
