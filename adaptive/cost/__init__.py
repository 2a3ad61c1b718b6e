"""The cost model: what a step of the target and the draft costs, from a profile or a
roofline, corrected online by the step times a run measures; and the profiler that builds it."""
