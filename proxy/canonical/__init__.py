"""The canonical form: the request and answers every stage works on, whatever API the client spoke (OpenAI's chat
shape, the proxy's in-band vocabulary inside it, a body held as pieces). Below every stage; imports none."""
