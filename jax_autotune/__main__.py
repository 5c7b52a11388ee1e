import sys

from jax_autotune.cli import main

sys.exit(main())
