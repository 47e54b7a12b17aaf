"""The job as every room of the runtime sees it, on the ground floor (it imports only torch and ``planner``):
the errors of bad settings and bad saved state, the checks of a settings section, the run's phases, the job's
process groups, what the trainer tells the runtime about the run and where it writes, and a pipeline stage as
a freezing method sees it."""
