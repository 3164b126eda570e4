"""Schema of the resume choice: what a run does when its run directory holds a checkpoint."""

import enum


class ResumeMode(enum.Enum):
    auto = "auto"  # resume from the latest checkpoint when there is one, else start at step 0
    never = "never"  # start at step 0; refuse a run directory that holds checkpoints
    must = "must"  # resume; refuse a run directory without a checkpoint
