"""megalith_comm: bootstrap, device mesh, process groups and collectives for megalith.

Nothing is implemented yet; see packages/comm/README.md for what is planned.
"""

__version__ = "0.1.0"
