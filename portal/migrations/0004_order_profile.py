import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0006_profiles"),
        ("portal", "0003_order_paid_late_and_btcpay_invoice"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="profile",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="campaigns.profile",
            ),
        ),
    ]
