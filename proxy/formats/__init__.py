"""Codecs below the doors: the conversions between chat messages and another API's own parts (Responses items,
Anthropic blocks), pure functions that the doors (parsing a request, rendering an answer) and the upstream
clients (sending a native request, reading its answer) both use.
"""
