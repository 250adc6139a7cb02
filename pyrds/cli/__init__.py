"""Command-line tools: ``pyrds ping``, ``pyrds info`` and ``pyrds stress`` (rds-tools work-alikes).

Every subcommand takes ``--backend kernel|userspace|auto`` and runs unchanged on either backend.
"""
