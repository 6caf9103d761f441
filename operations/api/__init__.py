"""The intents API (``/api/v1/``) an agent calls: views, serializers, authentication, rate
limits, JSON in and out, RFC 9457 problem details, the OpenAPI document and ``?wait=``."""
