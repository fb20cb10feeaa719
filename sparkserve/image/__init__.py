"""Stage 6 — image: the SM121 engine image made, verified and shipped; one room for "how is the image made".

    recipe      docker/recipe.yaml + its lock → build args (every FROM digest-pinned; the tag is the lock's
                sha256; overlays, checks, lanes overlay | prebuilt | source)
    identity    pure: the content fingerprint "same image" means, ChainIDs, image facts against a lock
    on_nodes    is the engine on every node, the same everywhere (the image by fingerprint; the process
                runtime's vLLM by its bytes): what ``up`` asks before it boots
    dialect     the engine's flag dialect read from the image's stored facts
    run         one throwaway container from the image (facts program, smoke)
    context     the recipe's files read here, each overlay checked against its sha256, the build context tar
    build       ``image build``: the recipe built, facts recorded, lock checked; gpu_smoke its GPU stage
    series      the lock's series (one recipe, several vLLM releases); relock; prebuilt (a published image
                taken as the base, its facts read back)
    verify      ``image verify`` / ``image ship`` across the configured nodes
    ship        only the layers a target lacks, node to node (+ ship_node: the node-side programs);
                registry (+ registry_node): ``ship --via registry``, a temporary registry on the source node

May import: ``nodes`` and every stage below it (``measure``, ``observe``, ``plan``, ``models``) and the ground
modules. Never ``deploy`` or above: ``deploy/up`` asks this stage, never the reverse.
"""
