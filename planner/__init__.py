"""Offline TimelyFreeze planner: traces -> schedule DAG -> HiGHS LP -> freeze plan.

Importable without torch. The runtime (``timelyfreeze``) depends on this package, never the reverse.
"""
