"""SWE-agent action reward: does the response issue the same command as the reference action?

Each step of a SWE-agent trajectory is a discussion followed by exactly one command in a fenced
block (the agent's interface admits one command per turn). The reward compares the response's
command with the command of the trajectory's next action, as text:
- 1.0: the same command after whitespace normalisation (each line stripped, runs of blanks
  collapsed, blank lines dropped), e.g. `open  src/a.py 40` = `open src/a.py 40`;
- 0.5: the same tool (first word: `open`, `edit`, `search_file`, `python`, `submit`, ...) with
  other arguments, so GRPO groups carry signal before exact matches are common;
- 0.0: another tool, or no fenced command.
It is verifiable because the reference is recorded in the data and the check is string equality;
the command is never executed (no sandbox, no repository checkout is needed).
"""

import re

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_command(text: str) -> str | None:
    """The last fenced block of an action, normalised; None when there is none."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    lines = (" ".join(line.split()) for line in blocks[-1].splitlines())
    command = "\n".join(line for line in lines if line)
    return command or None


def swe_action_reward(reference_action: str, response: str) -> float:
    target = extract_command(reference_action)
    got = extract_command(response.rsplit("</think>", 1)[-1])
    if target is None or got is None:
        return 0.0
    if got == target:
        return 1.0
    return 0.5 if got.split()[0] == target.split()[0] else 0.0
