import os
import sys

# The helpers and op table are plain modules next to the tests.
sys.path.insert(0, os.path.dirname(__file__))
