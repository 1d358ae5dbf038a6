"""Appends this process's pid to the file named by argv[1], then idles until killed (orphan check)."""

import os
import sys
import time

with open(sys.argv[1], "a") as fh:
    fh.write(f"{os.getpid()}\n")
time.sleep(120)
