"""The executor: workflows, steps, handles, recovery and the DBOS lifecycle."""
