"""``pytest-nccl explain``: a verdict after the fact, from the Flight Recorder dumps a job left
behind. ``load`` finds and reads them, ``verdict`` turns them into the judge's records and asks the
judge (pure), ``cli`` is the command."""
