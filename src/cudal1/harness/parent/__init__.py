"""The parent: the judging process itself.  It plans the devices, schedules jobs (the build farm,
one timing lane per GPU, or a Ray cluster), runs the static guards, starts each job's two
children (:mod:`.sandbox`), watches the GPU's other users, and assembles the verdict from both
children's raw times (:mod:`.stats`, :mod:`.assemble`).  No candidate code ever runs here: the
candidate's process and the reference worker are started from a forkserver, and this package
imports neither of their folders except for those two entry points (:mod:`.sandbox`)."""
