"""`python3 -m ascend_fleet.node.stage_weights ARGS` here; on a node the archive's own __main__
(ascend_fleet.operations.weights.stager_archive) runs the same main."""

import sys

from .main import main

sys.exit(main(sys.argv[1:]))
