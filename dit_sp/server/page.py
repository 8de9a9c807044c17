"""The video server's web page (``GET /``): submit a prompt, watch the queue and each job's progress, play a
finished video. Plain HTML and JavaScript on the server's own API (``/v1/videos``); with an API key, the
page asks for it and sends it as ``Authorization: Bearer`` (kept in the page's memory only)."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dit-sp video server</title>
<style>
body { font-family: sans-serif; max-width: 52em; margin: 2em auto; }
input, textarea, button { font: inherit; } textarea { width: 100%; }
table { border-collapse: collapse; width: 100%; } td, th { border-bottom: 1px solid #ccc; padding: .3em; }
#error, .error { color: #b00; }
</style></head>
<body>
<h1>dit-sp video server</h1>
<p>Model: <span id="model">?</span></p>
<form id="create">
  <label>Prompt <textarea id="prompt" rows="2" required></textarea></label>
  <label>Size <input id="size" placeholder="WxH, e.g. 32x32" size="10"></label>
  <label>Frames <input id="frames" type="number" min="1" size="5"></label>
  <label>Steps <input id="steps" type="number" min="1" size="5"></label>
  <label>Seed <input id="seed" type="number" size="6"></label>
  <label>API key <input id="key" type="password" size="12"></label>
  <button id="submit" type="submit">Generate</button>
</form>
<p id="error"></p>
<p id="queue-error" class="error"></p>
<h2>Jobs</h2>
<table><thead><tr><th>id</th><th>prompt</th><th>status</th><th>progress</th><th></th></tr></thead>
<tbody id="jobs"></tbody></table>
<video id="player" controls muted loop style="max-width: 100%; margin-top: 1em"></video>
<script>
const $ = (id) => document.getElementById(id);
function headers() {
  const key = $("key").value;
  return key ? {"Authorization": "Bearer " + key} : {};
}
async function api(path, options = {}) {
  const response = await fetch(path, {...options, headers: {...headers(), ...(options.headers || {})}});
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error((body.error && body.error.message) || response.statusText);
  }
  return response;
}
async function play(id) {
  const blob = await (await api("/v1/videos/" + id + "/content")).blob();
  $("player").src = URL.createObjectURL(blob);
  $("player").dataset.video = id;
}
async function refresh() {
  try {
    const models = await (await api("/v1/models")).json();
    $("model").textContent = models.data.map((m) => m.id).join(", ");
    const page = await (await api("/v1/videos?limit=50")).json();
    $("jobs").replaceChildren(...page.data.map((job) => {
      const row = document.createElement("tr");
      row.dataset.id = job.id;
      row.className = "job " + job.status;
      for (const text of [job.id.slice(0, 14), job.prompt, job.status, job.progress + "%"]) {
        const cell = document.createElement("td"); cell.textContent = text; row.append(cell);
      }
      const cell = document.createElement("td");
      if (job.status === "completed") {
        const button = document.createElement("button");
        button.textContent = "play"; button.className = "play"; button.onclick = () => play(job.id);
        cell.append(button);
      } else if (job.error) { cell.textContent = job.error.message; }
      row.append(cell);
      return row;
    }));
    $("queue-error").textContent = "";  // the queue's own: a submit's error stays until the next submit
  } catch (e) { $("queue-error").textContent = e.message; }
}
$("create").onsubmit = async (event) => {
  event.preventDefault();
  const body = {prompt: $("prompt").value};
  if ($("size").value) body.size = $("size").value;
  if ($("frames").value) body.num_frames = Number($("frames").value);
  if ($("steps").value) body.num_inference_steps = Number($("steps").value);
  if ($("seed").value) body.seed = Number($("seed").value);
  try {
    await api("/v1/videos", {method: "POST", body: JSON.stringify(body),
                             headers: {"Content-Type": "application/json"}});
    $("error").textContent = "";
  } catch (e) { $("error").textContent = e.message; }
  refresh();
};
refresh();
setInterval(refresh, 500);
</script>
</body></html>
"""
