"""Agents over HTTP: the user's agent code calls the policy through an OpenAI-compatible endpoint, and the run trains
on the tokens that endpoint sampled.

``server`` (the endpoint and its records; ``routes`` its HTTP routes, ``listen`` its sockets and bounds), ``chat``
(requests and replies in OpenAI's form), ``calls`` (the recorded calls and the joining rule), ``runner`` (agents run
per episode), ``command`` (an agent as a jailed program), ``policy`` (the Policy whose samples are agents' episodes);
the task is ``rlvr.tasks.agent``.
"""
