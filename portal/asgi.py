import os

from django.core.asgi import get_asgi_application

from common.heap import settle_after_first_request

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_asgi_application()

# As portal/wsgi.py: what every request uses is kept out of the full collections.
settle_after_first_request()
