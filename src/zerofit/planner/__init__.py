"""`zerofit plan`'s model of a run, torch-free: memory per GPU and step time of every strategy
(each engine's terms come from its spec), the fit against a GPU, and the pick for `auto`."""
