import os

from django.core.wsgi import get_wsgi_application

from common.heap import settle_after_first_request

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()

# What every request uses, loaded by the first, is kept out of the full
# garbage collections from then on (common/heap.py).
settle_after_first_request()
