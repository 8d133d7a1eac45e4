"""`context-proxy`: the command line (`main`) and the text rendering of the inspection views (`render`)."""
