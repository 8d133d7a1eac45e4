"""One request along the path: the pipeline that runs the stages in order, its plan and budget, what it continues
(stored answers, the proxy's references) and a client's own compaction request."""
