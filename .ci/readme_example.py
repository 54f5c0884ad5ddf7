"""Print the README's first ```python block (its first example of distributed tests), for CI to run
against the installed wheel: what a user copies from the README must pass."""

import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
block = re.search(r"^```python\n(.*?)^```", text, re.S | re.M)
if block is None or "def test_" not in block.group(1):
    sys.exit(f"{sys.argv[1]}: no ```python block with a test in it")
sys.stdout.write(block.group(1))
