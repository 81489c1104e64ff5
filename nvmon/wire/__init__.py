"""The MQTT wire contract: topics, payload builders and validating readers.

`nvmon.wire.payloads` builds and parses (pure); `nvmon.wire.mqtt` is the only module that talks
to a broker (aiomqtt 2.x) and is imported on its own, so readers need no network stack.
"""
