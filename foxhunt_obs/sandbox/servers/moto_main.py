"""``python -m foxhunt_obs.sandbox.servers.moto_main -H 127.0.0.1 -p PORT``: moto's own server with one
sandbox extension, so the scenario's EC2 instances keep the ids the scenario's history gives them.

The sandbox's Prometheus history names each node's instance in kube_node_info's provider_id
(``aws:///<az>/<id>``, ids from bills.instance_id); moto 5.2.1 gives every instance a random id and has
no way to ask for one (its ``_custom_id_`` tag covers other resources, not EC2 instances). Here
``run_instances(ClientToken="foxhunt-id:<id>")`` makes that instance's id ``<id>``; any other token, or
none, leaves moto as it is. Everything else is moto's server unchanged.
"""

from __future__ import annotations

ID_TOKEN = "foxhunt-id:"


def _install() -> None:
    from moto.ec2.models import instances

    original = instances.Instance.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        token = kwargs.get("client_token") or ""
        if token.startswith(ID_TOKEN):
            self.id = token[len(ID_TOKEN) :]  # before volumes and tags are attached under the id

    instances.Instance.__init__ = init


if __name__ == "__main__":
    _install()
    from moto.server import main

    main()
