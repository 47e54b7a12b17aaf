"""Egeria (Wang et al., EuroSys'23): the method, its controller and plasticity math, the reference model,
the background worker, activation capture and the activation cache."""
