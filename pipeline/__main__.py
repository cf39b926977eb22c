import os
import sys

from pipeline.cli import EXIT_BROKEN_PIPE, main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # the reader of the output (`| head -1`, a closed pager) stopped reading: nothing more to say, no
    # traceback; later writes (and the flush at exit) go nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    code = EXIT_BROKEN_PIPE
sys.exit(code)
