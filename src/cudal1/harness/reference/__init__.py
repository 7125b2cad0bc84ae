"""The clean reference worker: one process per job that never imports candidate code.  It imports
the task, builds the reference and its float64 twin, draws every input from the secret seed,
compares the candidate's outputs, times both sides in alternating blocks under the clean window
(stopping the candidate's whole process tree while the reference is timed) and sends the signed
verdict (:mod:`.worker`).  It reaches the candidate only through :mod:`.link`."""
