"""The app `openenv.yaml` names (`uvicorn server.app:app`, run in environments/openenv/rookworld_chess): rookworld's OpenEnv server
with its default settings. `rookworld serve` runs the same app with flags for them, as the Dockerfile does."""

import uvicorn

from rookworld.integrations.openenv import ChessEngines, create_chess_app

app = create_chess_app(ChessEngines())


def main() -> None:
    uvicorn.run(app, host="0.0.0.0", port=8000)


if __name__ == "__main__":
    main()
