"""The course tools behind ``python -m milestones``: a map of the milestones, and what each one changes.

Not a milestone (its name does not start with ``mNN_``): it reads the milestone packages and never changes them.

* ``catalog.py``: finds the ``mNN_<idea>`` packages and what each says about itself (no import needed).
* ``gains.py``: which committed H200 result measures each milestone's gain, and how to read it.
* ``listing.py``: ``python -m milestones``, one block per milestone.
* ``changes.py``: what a milestone adds or overrides relative to the one before it (``inspect`` + ``ast``).
* ``diff_view.py``: those changes as text: side by side, stacked, a unified diff, or a ``--stat`` summary.
* ``style.py``: colour, only on a terminal and never with ``NO_COLOR``.
* ``cli.py``: the command line.
"""
