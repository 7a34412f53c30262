"""The OpenAI-compatible HTTP server, one concept per module (the entry point, and its
description, is :mod:`minillm.serve.server`): ``parts`` (limits, unknown and unsupported
fields, text that is not Unicode), ``formats`` (output constraints), ``schemas`` (the
request bodies), ``errors`` (OpenAI's error body, the limits middleware, the handlers),
``responses`` (the bodies and events), ``following`` (engine requests as they run),
``prometheus`` (``/metrics``), ``app`` (the routes) and ``background`` (a server in a
thread)."""
