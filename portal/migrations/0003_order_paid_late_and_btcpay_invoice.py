from django.db import migrations, models


def paid_late_from_exception(apps, schema_editor):
    # Orders confirmed late before the flag existed carry it in `exception`.
    Order = apps.get_model("portal", "Order")
    Order.objects.filter(exception="paid_late").update(paid_late=True)


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0002_seed_catalog"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="btcpay_invoice_id",
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.AddField(
            model_name="order",
            name="paid_late",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="order",
            name="payment_link",
            field=models.CharField(
                blank=True,
                help_text="the processor's payment URI, when it gave one",
                max_length=1000,
            ),
        ),
        migrations.AddConstraint(
            model_name="order",
            constraint=models.UniqueConstraint(
                condition=models.Q(("btcpay_invoice_id", ""), _negated=True),
                fields=("btcpay_invoice_id",),
                name="one_order_per_btcpay_invoice",
            ),
        ),
        migrations.RunPython(paid_late_from_exception, migrations.RunPython.noop),
    ]
