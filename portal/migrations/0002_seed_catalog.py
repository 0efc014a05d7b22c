"""The catalog a fresh install starts with; staff edit it in the admin afterwards."""

from decimal import Decimal

from django.db import migrations

GPUS = [
    # name, architecture, memory GB, price per day, throughput relative to an A40, stock
    ("L4", "Ada", 24, "8.50", "0.60", 8),
    ("RTX 4090", "Ada", 24, "9.90", "1.30", 8),
    ("A40", "Ampere", 48, "14.00", "1.00", 6),
    ("RTX A6000", "Ampere", 48, "15.00", "1.05", 4),
    ("L40S", "Ada", 48, "24.00", "1.80", 4),
    ("RTX 6000 Ada", "Ada", 48, "22.00", "1.70", 4),
    ("A100 SXM", "Ampere", 80, "36.00", "2.20", 2),
]
ENVIRONMENTS = [
    ("BriefGPU worker 0.1", "PyTorch", "2.13.0", "13.0", "briefgpu/worker:0.1-cuda13.0"),
    ("PyTorch 2.13", "PyTorch", "2.13.0", "13.0", "briefgpu/pytorch:2.13-cuda13.0"),
    ("PyTorch 2.8", "PyTorch", "2.8.0", "12.8", "briefgpu/pytorch:2.8-cuda12.8"),
]
DURATIONS = [
    (3, "estimate the work on a sample: profiling, a first batch, validating an automation"),
    (7, "a first controlled campaign: full processing and corrections"),
    (30, "several waves, several representation versions, or an adaptation campaign"),
]
CURRENCIES = [
    ("BTC", "Bitcoin", 8, "bitcoin", "amount"),
    ("LTC", "Litecoin", 8, "litecoin", "amount"),
    ("XMR", "Monero", 12, "monero", "tx_amount"),
]


def seed(apps, schema_editor):
    GpuModel = apps.get_model("portal", "GpuModel")
    Environment = apps.get_model("portal", "Environment")
    RentalDuration = apps.get_model("portal", "RentalDuration")
    CryptoCurrency = apps.get_model("portal", "CryptoCurrency")
    for position, (name, arch, memory, price, rel, stock) in enumerate(GPUS):
        GpuModel.objects.get_or_create(
            name=name,
            defaults={
                "architecture": arch,
                "memory_gb": memory,
                "price_per_day": Decimal(price),
                "relative_throughput": Decimal(rel),
                "stock": stock,
                "position": position,
            },
        )
    for position, (name, framework, version, cuda, image) in enumerate(ENVIRONMENTS):
        Environment.objects.get_or_create(
            name=name,
            defaults={
                "framework": framework,
                "framework_version": version,
                "cuda_version": cuda,
                "image": image,
                "position": position,
            },
        )
    for days, purpose in DURATIONS:
        RentalDuration.objects.get_or_create(days=days, defaults={"purpose": purpose})
    for code, name, decimals, scheme, param in CURRENCIES:
        CryptoCurrency.objects.get_or_create(
            code=code,
            defaults={
                "name": name,
                "decimals": decimals,
                "uri_scheme": scheme,
                "amount_param": param,
            },
        )


class Migration(migrations.Migration):
    dependencies = [("portal", "0001_orders")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
