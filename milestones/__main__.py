"""``python -m milestones``: every milestone, its idea, demo, doc page and measured gain; ``diff`` shows a delta.

    python -m milestones                    # the list
    python -m milestones diff m06 m07       # what m07 adds or overrides relative to m06
    python -m milestones diff --help        # --unified, --stat and the rest
"""

import sys

from milestones._course.cli import main

if __name__ == "__main__":
    sys.exit(main())
