"""Render a terminal screen captured with tmux as the SVG of the docs (docs/img/compare.svg).

How compare.svg was made (120x32, `make demo`'s command, captured 2.3 s in):

    tmux -L docs new-session -d -s cap -x 120 -y 32
    tmux -L docs send-keys -t cap "fanout compare 'Tell me about rivers, in a few sentences.' \
        --config config/default.toml" Enter
    sleep 2.7; tmux -L docs capture-pane -t cap -p -e > docs/img/compare.ansi
    python docs/img/ansi_to_svg.py docs/img/compare.ansi docs/img/compare.svg
"""

import sys

from rich.console import Console
from rich.text import Text

raw = open(sys.argv[1], encoding="utf-8").read().rstrip("\n").splitlines()
while raw and not raw[-1].strip():
    raw.pop()
console = Console(record=True, width=120, force_terminal=True, color_system="truecolor",
                  file=open("/dev/null", "w"))
for line in raw:
    # tmux keeps a VS16 emoji in one cell: drop the selector so rich measures it as tmux drew it
    console.print(Text.from_ansi(line.replace("\ufe0f", "")), no_wrap=True, crop=True)
console.save_svg(sys.argv[2], title="fanout compare (make demo), mid-stream")
