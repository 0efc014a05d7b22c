from django import template

register = template.Library()


@register.filter
def get_item(mapping, key):
    """mapping[key] in a template, for JSON fields keyed by verdict."""
    return (mapping or {}).get(key, [])
