import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0004_order_profile"),
    ]

    operations = [
        migrations.AddField(
            model_name="paymentaddress",
            name="derivation_index",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="DerivationChain",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key_id", models.CharField(max_length=64, unique=True)),
                ("fingerprint", models.CharField(max_length=8)),
                ("script", models.CharField(max_length=20)),
                ("next_index", models.PositiveIntegerField(default=0)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "currency",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="portal.cryptocurrency",
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="paymentaddress",
            name="chain",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="addresses",
                to="portal.derivationchain",
            ),
        ),
        migrations.AddConstraint(
            model_name="paymentaddress",
            constraint=models.UniqueConstraint(
                fields=("chain", "derivation_index"), name="one_address_per_derivation_index"
            ),
        ),
    ]
