from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0007_order_access"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="paid_amount",
            field=models.DecimalField(blank=True, decimal_places=12, max_digits=30, null=True),
        ),
    ]
