"""`python -m onnxkiln`: the `onnxkiln` command."""

import sys

from onnxkiln.cli import main

sys.exit(main())
